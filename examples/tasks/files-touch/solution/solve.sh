#!/bin/bash
touch a.txt b.txt c.txt
