#!/bin/bash
sort in.txt > out.txt
