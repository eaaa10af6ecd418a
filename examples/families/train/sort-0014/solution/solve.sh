#!/bin/bash
sort items.txt > out.txt
