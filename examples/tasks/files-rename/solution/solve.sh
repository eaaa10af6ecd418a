#!/bin/bash
mv old.txt new.txt
