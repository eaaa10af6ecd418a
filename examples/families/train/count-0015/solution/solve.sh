#!/bin/bash
wc -l < list.txt > out.txt
